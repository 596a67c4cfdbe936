"""foreshock.simulator"""
