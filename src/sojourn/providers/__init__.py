"""Where machines come from: one small interface (base.py), one module per provider."""
