#!/bin/bash
# Runs inside the Soft-RoCE VM before the job: loads rdma_rxe from the extracted kernel package
# (module autoloading does not reach the chroot) and creates rxe0 on veth0 (10.77.0.1) and rxe1
# on veth1 (10.78.0.1), both in the VM's root network namespace.
set -eu
mp() { modprobe -d "$WB_VM_MODDIR" "$1"; }
mp crc32_generic
mp rdma_rxe
mp veth
ip link set lo up
ip link add veth0 type veth peer name veth1
ip addr add 10.77.0.1/24 dev veth0
ip addr add 10.78.0.1/24 dev veth1
ip link set veth0 up
ip link set veth1 up
rdma link add rxe0 type rxe netdev veth0
rdma link add rxe1 type rxe netdev veth1
