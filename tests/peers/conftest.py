"""Keep the default pytest run out of this folder: `check_peers.py` is a
script (`nox -s peers`) that needs NumPyro, distrax and TFP installed."""

collect_ignore_glob = ["*.py"]
