"""duplex.transport"""
