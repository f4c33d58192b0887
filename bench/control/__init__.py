"""Controllable generation, measured: infilling, prompting, exact lengths, long text, label guidance."""
