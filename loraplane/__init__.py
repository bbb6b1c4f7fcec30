"""loraplane: the CLI and process orchestration (`loraplane up`, `loraplane serve`)."""

__version__ = "0.1.0"
