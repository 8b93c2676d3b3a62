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
# output dirs go), SKYRL_TRAIN (the command to run). The keys it sets per stage (model.path,
# environment.dataset, trainer.output_dir, hydra.run.dir) are refused as extra overrides:
# coming last, they would win in every stage; so is trainer.export_hf=false (the next stage
# starts from the export). With trainer.dry_run=true a stage that has no final_hf yet is
# checked, and the next one with the same model (nothing is exported by a dry run).
set -euo pipefail

is_true() { # a bool value spelled any way skyrl-train reads one
  case "$1" in
    [Tt][Rr][Uu][Ee] | [Yy][Ee][Ss] | [Yy] | [Oo][Nn] | 1) return 0 ;;
    *) return 1 ;;
  esac
}

dry_run=false
for arg in "$@"; do
  key="${arg%%=*}"
  key="${key#+}"
  key="${key#+}"
  case "$key" in
    model.path) where="stage 1's with CURRICULUM_MODEL" ;;
    trainer.output_dir | hydra.run.dir) where="where they go with CURRICULUM_DIR" ;;
    environment.dataset) where="them with CURRICULUM_STAGES" ;;
    trainer.dry_run) # the last one wins
      if is_true "${arg#*=}"; then dry_run=true; else dry_run=false; fi
      continue
      ;;
    trainer.export_hf)
      is_true "${arg#*=}" && continue
      echo "error: $key: each stage starts from the previous one's final_hf; leave it true" >&2
      exit 2
      ;;
    *) continue ;;
  esac
  echo "error: $key: run.sh sets it for each stage; set $where" >&2
  exit 2
done

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
  if [[ -d "$out/final_hf" || $dry_run == false ]]; then
    previous=("model.path=$out/final_hf")
  fi
done
