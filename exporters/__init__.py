"""foreshock.exporters"""
