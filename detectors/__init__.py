"""foreshock.detectors"""
