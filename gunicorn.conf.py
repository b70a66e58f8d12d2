"""gunicorn settings shared by `make demo`, the Dockerfile and the benchmarks (`gunicorn -c gunicorn.conf.py`).

Values can be overridden on the command line (e.g. `--bind`, `--workers`).
"""

import ctypes
import ctypes.util
import os

wsgi_app = "conch.wsgi:application"
bind = os.environ.get("CONCH_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("CONCH_WEB_WORKERS", "2"))
threads = int(os.environ.get("CONCH_WEB_THREADS", "4"))
# Uploads of several GiB and inference requests forwarded to Triton can take minutes.
timeout = 900

# glibc's malloc raises its mmap threshold after large blocks are freed, so the 8 MiB parts an
# upload streams to S3 then come from the heap and stay in the worker's RSS after the upload.
# A fixed threshold keeps such blocks on mmap: freed blocks go back to the OS (bench/upload.py).
M_MMAP_THRESHOLD = -3


def post_worker_init(worker):
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        ctypes.CDLL(libc_name).mallopt(M_MMAP_THRESHOLD, 1024 * 1024)
