"""Finds libraries NVIDIA ships as Python wheels (nvidia-cudnn-cu13,
nvidia-nccl-cu13, CUDA 13's nvidia/cu13, ...), where they are not beside the
CUDA toolkit (as on images whose cuDNN and NCCL come from pip).

    python3 scripts/nvidia_wheel.py cudnn cudnn.h libcudnn.so
prints the package's include folder and the library's path, one per line, and
exits 0; exits 1 when the package, header or library is missing (meson.build).

    python3 scripts/nvidia_wheel.py --lib-dirs cudnn nccl cu13
prints the lib folders of those packages that are installed, joined by ':'
(for LD_LIBRARY_PATH; scripts/gpu-check).
"""
import glob
import importlib
import os
import sys


def package_roots(package):
    try:
        module = importlib.import_module(f"nvidia.{package}")
    except ImportError:
        return []
    return list(getattr(module, "__path__", [])) or [os.path.dirname(module.__file__)]


def lib_dirs(packages):
    found = []
    for package in packages:
        for root in package_roots(package):
            lib = os.path.join(root, "lib")
            if os.path.isdir(lib) and lib not in found:
                found.append(lib)
    print(":".join(found))
    return 0


def main():
    if sys.argv[1:2] == ["--lib-dirs"]:
        return lib_dirs(sys.argv[2:])
    package, header, library = sys.argv[1:4]
    for root in package_roots(package):
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
