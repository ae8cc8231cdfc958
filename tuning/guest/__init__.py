"""A cgroup v2 host in a box: Debian 12's 6.1 kernel (the Amazon Linux 2023 line) under QEMU.

qemu (the command line, pure), assets (kernel, modules, initramfs), machine (boot, run one command, power off or
kill). The tests' guest tier and `iobatch lab --guest` run on it.
"""
