#!/usr/bin/env python3
"""Writes scikit-learn's digits (Debian python3-sklearn; 1,797 8x8 images, 64 pixel features 0..16, 10 classes) as a
CSV with a header p0..p63,label, for bench_learning. Usage: digits_csv.py OUT.csv"""
import csv
import sys

from sklearn.datasets import load_digits

digits = load_digits()
with open(sys.argv[1], "w", newline="") as out:
    writer = csv.writer(out)
    writer.writerow([f"p{i}" for i in range(digits.data.shape[1])] + ["label"])
    for row, label in zip(digits.data, digits.target):
        writer.writerow([int(v) for v in row] + [int(label)])
