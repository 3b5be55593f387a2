# Sourced by the peers' scripts (benchmarks/peers/*_peer.sh): what every
# peer's virtual environment under $PEER needs once made.

# A peer on ale-py 0.8, which has no ROMs of its own, gets the project's
# ale-py's, once.
import_roms() {
  if [ ! -e "$PEER/roms_imported" ]; then
    local roms
    roms="$(python3 -c 'import ale_py, os; print(os.path.join(os.path.dirname(ale_py.__file__), "roms"))')"
    "$PEER/venv/bin/ale-import-roms" "$roms" >/dev/null
    touch "$PEER/roms_imported"
  fi
}

# A folder for this run under $PEER; sets RUN_DIR and LOG.
new_run_dir() {
  RUN_DIR="$(mktemp -d "$PEER/run.XXXXXX")"
  LOG="$RUN_DIR/log.txt"
}
