"""Network-namespace testbed, traffic generators and fault injection (issue 9)."""
