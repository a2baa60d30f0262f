#!/usr/bin/env python3
"""The PyTorch peer of unison-kernels-gbench lives in bench/peers/torch_kernels.py;
this path runs it for the scripts that call it here."""
import os
import sys

peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "torch_kernels.py")
os.execv(sys.executable, [sys.executable, peer] + sys.argv[1:])
