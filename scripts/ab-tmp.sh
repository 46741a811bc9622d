xz -t stage/bin.tar.xz || exit 9; . scripts/unpack-stage.sh; unpack_stage .
mkdir -p $OUT/pipeline
R="paced,memory,kernel,study,s1-c1,s2-c1,s8-c1,s32-c1,vmm+ipc-event+s256-c1"
stage/bin/gpu-ipc bench pipeline --no-progress --rows $R --out $OUT/pipeline/no-mps.json --markdown $OUT/pipeline/no-mps.md > $OUT/pipeline/no-mps.log 2>&1; echo "no-mps rc $?"
stage/bin/gpu-ipc bench pipeline --mps --no-progress --rows $R --out $OUT/pipeline/mps.json --markdown $OUT/pipeline/mps.md > $OUT/pipeline/mps.log 2>&1; echo "mps rc $?"
stage/bin/gpu-ipc bench targets --no-mps $OUT/pipeline/no-mps.json --mps $OUT/pipeline/mps.json --markdown $OUT/pipeline/targets.md > /dev/null 2>&1; echo "targets rc $?"
cat $OUT/pipeline/targets.md
grep -E "^\| (single|ours-legacy-[a-z-]+-s(1|2|8)-c1)" $OUT/pipeline/mps.md | cut -d'|' -f2-5
tar -czf $OUT/pipeline.tgz -C $OUT pipeline && rm -rf $OUT/pipeline
