"""Configuration: flat YAML, one owner per key, attrs sections structured strictly by cattrs."""
