"""A minimal django-oscar shop for the gateway's real-shop test."""
