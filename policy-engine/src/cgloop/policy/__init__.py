"""Policy engine: declarative remediation with guards, verification, rollback and planners"""
