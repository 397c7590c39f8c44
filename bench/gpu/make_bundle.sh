#!/bin/bash
# Packs what bench/gpu/device_check.sh needs on a GPU machine that has CUDA, cuDNN, NCCL and PyTorch but none of
# Debian's libraries (oneDNN, ZeroMQ, UCX, fmt, Boost.Test): the stripped tandem binary, libtandem, the
# gpu-labelled test programs and the device all-reduce benchmark from BUILD (default build/default), with every
# shared library they load from this machine except glibc's, libstdc++ and libgcc_s, into .gpu/bundle.tar.xz
# (ignored by git; about 15 MB, so that the repository plus the bundle travel under the device tool's 64 MiB).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$repo/build/default}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
out=$stage/gpu
mkdir -p "$out/bin" "$out/lib"
progs=("$build/bin/tandem" "$build/tests/compute/gpu/test_compute_gpu" "$build/tests/api/c_device_collectives_gpu_test"
       "$build/tests/api/device_allreduce_bench")
for p in "${progs[@]}"; do objcopy --strip-debug "$p" "$out/bin/$(basename "$p")"; done
soname=$(objdump -p "$build/lib/libtandem.so" | awk '$1 == "SONAME" {print $2}')
objcopy --strip-debug "$(readlink -f "$build/lib/libtandem.so")" "$out/lib/$soname"
for p in "${progs[@]}" "$build/lib/libtandem.so"; do
  ldd "$p" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*|libstdc++.so*|libgcc_s.so*|libtandem.so*) ;;
    *) objcopy --strip-debug "$lib" "$out/lib/$(basename "$lib")" ;;
  esac
done
grep -qx '/.gpu/' "$repo/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >> "$repo/.git/info/exclude"
mkdir -p "$repo/.gpu"
tar -C "$stage" -cJf "$repo/.gpu/bundle.tar.xz.tmp" gpu && mv "$repo/.gpu/bundle.tar.xz.tmp" "$repo/.gpu/bundle.tar.xz"
du -sh "$repo/.gpu/bundle.tar.xz"
