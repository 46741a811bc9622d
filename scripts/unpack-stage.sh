# Sourced by the GPU-machine scripts: stage/bin travels packed (stage/bin.tar.xz, see scripts/stage-gpu.sh: the
# working tree plus stage/ must stay under the 64 MiB the device tool carries); this unpacks it once.
unpack_stage() {
    local root="$1"
    if [ ! -x "$root/stage/bin/cargo-nextest" ] && [ -f "$root/stage/bin.tar.xz" ]; then
        mkdir -p "$root/stage/bin"
        tar -C "$root/stage/bin" -xJf "$root/stage/bin.tar.xz"
    fi
}
