"""lora-dp: a small transformer fine-tuned through LoRA adapters (A frozen, as in FFA-LoRA), record-level DP-SGD
in every client and client-level central DP on the server, booked in one privacy ledger; only adapters travel."""
