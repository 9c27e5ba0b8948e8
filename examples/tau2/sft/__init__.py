"""Supervised fine-tuning: successful trajectories to chat data, and AReaL's SFTTrainer on it."""
