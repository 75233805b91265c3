"""Shared pytest set-up: keep the tests on few threads so the suite is fast on 2 cores."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
