NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
$NCU --kernel-name regex:gemv --launch-skip-before-match 0 --launch-count 9 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
  --section Occupancy --section ComputeWorkloadAnalysis --section LaunchStats \
  python3 .dev/pa/gemv_one.py > /tmp/ncu.txt 2>&1
grep -n "gemv_\|Duration\|Throughput\|Warp Cycles\|Stall\|Issued Warp\|No Eligible\|Active Warps\|Eligible Warps\|Achieved Occ\|Registers\|Pipe\|L2 Hit\|Mem Busy\|Max Bandwidth\|Executed Ipc\|Dram\|DRAM" /tmp/ncu.txt | head -300
