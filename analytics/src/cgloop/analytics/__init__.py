"""Features, cloud-gaming flow classifier, SLO and abuse detectors, streaming worker"""
