#!/bin/bash
# rounds x prompts x configs, configs alternated (order rotated per round)
out=$1; shift
: > $out
for round in 1 2; do
  for p in docs/evidence/spec-decoding/prompts/p*.txt; do
    for cfg in "$@"; do
      ./target/release/rllama run -m qwen2.5-coder-0.5b --chat -f $p -n 600 -t 2 $cfg --json 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin); s=d.get('speculative') or {}
print(json.dumps({'round':$round,'prompt':'$(basename $p)','cfg':'$cfg','tg':d['timings']['decode_tokens_per_s'],'pp':d['timings']['prompt_tokens_per_s'],'n':d['timings']['generated_tokens'],'ids':hash(tuple(d['generated_ids'])),'acc':s.get('acceptance'),'steps':s.get('steps')}))" >> $out
    done
  done
done
