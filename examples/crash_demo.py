"""Placeholder replaced below in this same change."""
