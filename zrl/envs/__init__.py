"""zrl/envs"""
