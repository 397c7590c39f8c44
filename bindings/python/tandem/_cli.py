"""The `tandem` command of an installed wheel: the real executable ships inside this package (tandem/bin/tandem,
next to libtandem), and this entry point replaces itself with it, arguments and all."""
import os
import sys


def executable():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "tandem")


def main():
    exe = executable()
    if not os.access(exe, os.X_OK):
        sys.stderr.write("tandem: the command is not part of this installation (%s missing)\n" % exe)
        return 127
    os.execv(exe, [exe] + sys.argv[1:])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
