#!/bin/bash
set -euo pipefail
{ echo "id,name,email,city"
  jq -r 'map(select(.active)) | sort_by(.id)[] | [.id, .name, .contact.email, .contact.city] | @csv' users.json
} > active_users.csv
