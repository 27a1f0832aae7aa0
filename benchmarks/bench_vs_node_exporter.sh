#!/bin/bash
# The agent against node_exporter in the same run: both scraped every 1 s for 60 s, the
# agent sampling 8 fake GPUs (4 per PCIe switch: topology recorded) every 1 s, telemetry
# written; prints each process's CPU share of one core. Needs node_exporter
# (Debian: apt-get install prometheus-node-exporter).
set -u
cd "$(dirname "$0")/.." || exit 1
/usr/bin/prometheus-node-exporter --web.listen-address=127.0.0.1:19100 >/dev/null 2>&1 &
NE=$!
.venv/bin/ncclscope agent --fake-gpus 8 --fake-gpus-per-switch 4 --interval 1 --listen 127.0.0.1:19477 --out "$(mktemp -d)" >/dev/null 2>&1 &
AG=$!
sleep 8
cpu() { awk '{print $14+$15}' /proc/"$1"/stat; }
n0=$(cpu $NE); a0=$(cpu $AG); t0=$(date +%s.%N)
for _ in $(seq 60); do curl -s 127.0.0.1:19100/metrics >/dev/null; curl -s 127.0.0.1:19477/metrics >/dev/null; sleep 1; done
n1=$(cpu $NE); a1=$(cpu $AG); t1=$(date +%s.%N)
hz=$(getconf CLK_TCK)
python3 -c "
t=$t1-$t0
print('node_exporter: %.2f%% of a core' % (100*($n1-$n0)/$hz/t))
print('ncclscope agent: %.2f%% of a core' % (100*($a1-$a0)/$hz/t))"
kill $NE $AG; wait 2>/dev/null
