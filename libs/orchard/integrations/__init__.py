"""Adapters that let third-party agent harnesses run unmodified on Orchard (each needs its harness installed)."""
