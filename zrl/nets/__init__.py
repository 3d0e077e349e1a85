"""zrl/nets"""
