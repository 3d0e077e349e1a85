"""zrl/config"""
