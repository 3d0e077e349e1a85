"""zrl/cli"""
