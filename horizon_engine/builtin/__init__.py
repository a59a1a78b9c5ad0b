"""The core's own plugins, registered on the plugin manager like any third-party plugin."""
