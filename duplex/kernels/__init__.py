"""duplex.kernels"""
