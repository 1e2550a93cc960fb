"""The pure quota arithmetic (shared with the scheduler once fair share lands)."""
