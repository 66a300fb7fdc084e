"""The kernel's own plugins: its config keys and checks, and the default owner of every role."""
