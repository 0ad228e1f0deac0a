#!/usr/bin/env bash
# Copy one stage folder as each of several git revisions holds it into builds/<name>/ (git-ignored), so that
# gpu_check.sh's part `builds` tests and times each build's kernels against the others' in one run, on one machine.
#   bash scripts/stage_builds.sh stage12_hopper_attention main some-branch 1e1933b
# A build's name is its revision with each character that is not a letter or a digit made "_" (a package name:
# its tests import their stage's modules relatively). Name `builds` in the device run's carry: it is ignored.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 STAGE_FOLDER REVISION [REVISION ...]"; exit 2; }
stage=$1; shift
[ -d "$stage" ] || { echo "$0: no stage folder $stage here (run it from the repository root)"; exit 2; }
rm -rf builds && mkdir builds
for rev in "$@"; do
  git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "$0: no revision $rev"; rm -rf builds; exit 2; }
  name=b_$(printf '%s' "$rev" | tr -c 'A-Za-z0-9' '_')
  mkdir "builds/$name"
  git archive "$rev" "$stage" | tar -x -C "builds/$name" --strip-components=1
  echo "builds/$name: $stage at $(git rev-parse --short "$rev") ($rev)"
done
