NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
cd scripts/gpu
for K in silu_mul_quant_fp8 add_rmsnorm_quant_fp8; do $NCU --kernel-name $K --launch-count 1 --clock-control none \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section Occupancy --section InstructionStats --metrics smsp__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio \
  python3 row_kernels.py >> /tmp/ncu2.txt 2>&1; done
mkdir -p $OUT; cp /tmp/ncu2.txt $OUT/
grep -v "^\s*$" /tmp/ncu2.txt | grep -v "\-\-\-\-" | grep -E "silu_mul|add_rmsnorm|Duration|Throughput|pipe|Issue Slots|Eligible|Warp Cycles|stalled|Registers|Achieved|Theoretical Occ|Block Limit|Executed Ipc|Stall" | head -80
