"""foreshock.dashboards"""
