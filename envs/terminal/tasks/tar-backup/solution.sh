#!/bin/bash
set -euo pipefail
tar -czf backup.tar.gz --exclude='*.log' --exclude='project/tmp' project
