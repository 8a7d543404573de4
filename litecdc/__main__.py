"""``python -m litecdc`` runs the CLI (the same as the ``litecdc`` command)."""

from litecdc.cli import main

if __name__ == "__main__":
    main()
