"""Finds a library NVIDIA ships as a Python wheel (nvidia-cudnn-cu13,
nvidia-nccl-cu13, ...), for meson.build where it is not beside the CUDA
toolkit (as on images whose cuDNN and NCCL come from pip).

    python3 scripts/nvidia_wheel.py cudnn cudnn.h libcudnn.so
prints the package's include folder and the library's path, one per line, and
exits 0; exits 1 when the package, header or library is missing.
"""
import glob
import importlib
import os
import sys


def main():
    package, header, library = sys.argv[1:4]
    try:
        module = importlib.import_module(f"nvidia.{package}")
    except ImportError:
        return 1
    roots = list(getattr(module, "__path__", [])) or [os.path.dirname(module.__file__)]
    for root in roots:
        include = os.path.join(root, "include")
        # Wheels carry only the versioned name (libcudnn.so.9), no plain .so.
        found = sorted(glob.glob(os.path.join(root, "lib", library + "*")), key=len)
        if os.path.isfile(os.path.join(include, header)) and found:
            print(include)
            print(found[0])
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
