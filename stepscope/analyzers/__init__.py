"""Analyzers: plain functions over recorded steps, samples and Kineto traces."""
