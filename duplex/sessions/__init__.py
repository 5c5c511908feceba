"""duplex.sessions"""
