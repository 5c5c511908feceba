"""duplex.models"""
