rules:
  - name: a
