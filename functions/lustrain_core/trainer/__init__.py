"""The trainer's memory plan and presets, as the control plane reads them: copies of trainer/lustrain_trainer's
plan.py and presets.py (scripts/refresh_trainer_plan.py writes them; a test keeps them equal)."""
