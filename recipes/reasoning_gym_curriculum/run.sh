#!/usr/bin/env bash
# A reasoning-gym curriculum: one training run per stage, each starting from the policy the
# previous stage exported (model.path=<previous stage>/final_hf). A stage whose final_hf
# already exists is skipped, so re-running the script continues where it stopped (an
# interrupted stage resumes from its own checkpoint: trainer.resume=auto).
#
#   bash recipes/reasoning_gym_curriculum/run.sh [extra overrides for every stage]
#
# Environment: CURRICULUM_STAGES (reasoning-gym datasets, easiest first), CURRICULUM_MODEL
# (stage 1's model.path; default: the experiment's), CURRICULUM_DIR (where the stages'
# output dirs go), SKYRL_TRAIN (the command to run). Do not pass model.path as an extra
# override: it would replace the chain from stage 2 on. With trainer.dry_run=true a stage
# that has no final_hf yet is checked, and the next one with the same model (nothing is
# exported by a dry run).
set -euo pipefail

read -r -a stages <<< "${CURRICULUM_STAGES:-chain_sum basic_arithmetic gsm_symbolic}"
root="${CURRICULUM_DIR:-outputs/reasoning_gym_curriculum}"
read -r -a skyrl_train <<< "${SKYRL_TRAIN:-skyrl-train}"
previous=(${CURRICULUM_MODEL:+"model.path=$CURRICULUM_MODEL"})

for i in "${!stages[@]}"; do
  dataset="${stages[$i]}"
  out="$root/stage$((i + 1))-$dataset"
  if [[ -d "$out/final_hf" ]]; then
    echo "== stage $((i + 1)): $dataset already trained ($out/final_hf)"
  else
    echo "== stage $((i + 1)): $dataset -> $out"
    "${skyrl_train[@]}" experiment=reasoning_gym_curriculum \
      "environment.dataset=$dataset" "trainer.output_dir=$out" "hydra.run.dir=$out" \
      ${previous[@]+"${previous[@]}"} "$@"
  fi
  # a dry run exports nothing: a stage not trained yet hands on the model it was checked with
  if [[ -d "$out/final_hf" || " $* " != *" trainer.dry_run=true "* ]]; then
    previous=("model.path=$out/final_hf")
  fi
done
