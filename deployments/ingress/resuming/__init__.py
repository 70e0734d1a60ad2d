"""A connection's side of resumes: claims.py (Claims: a frame that claims a parked session, handled
before the next frame is read). ResumeBook, the records a resume needs, is resume.py beside it."""
