"""foreshock.cli"""
