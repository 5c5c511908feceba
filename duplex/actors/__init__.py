"""duplex.actors"""
