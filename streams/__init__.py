"""foreshock.streams"""
