"""Actuators: the ONOS driver and node-agent clients"""
