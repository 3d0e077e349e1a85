"""zrl/utils"""
