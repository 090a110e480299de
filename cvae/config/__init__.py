"""The run's configuration, nested by concern: sections, the registered components
whose options they hold, presets, TOML files and the flat names of earlier versions."""
